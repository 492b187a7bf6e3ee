from resacct.cli import entry_point

entry_point()
