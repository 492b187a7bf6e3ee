"""How each claim is measured against torch: one module per area, mirroring ``resacct/<area>.py``
and ``resacct/specs/<area>.claims.yaml``. Every module here is imported by the registry on first use."""
