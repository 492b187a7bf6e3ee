"""The training substrate the lecture builds and the claims run: models (its GPT, Cruncher, MLPs),
initialisation, optimizers written from scratch, token data, the training loop, seeding, and
checkpoints that resume exactly and never destroy the last good one."""
