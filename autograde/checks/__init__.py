"""Hidden-test checks, one module per chapter. The hidden cells of the
notebooks in solutions/ call these; each check exercises a behaviour over many
inputs (shapes, batch axes, masks, extreme values) against autograde.reference."""
