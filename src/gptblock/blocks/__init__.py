"""The block: its config and input checks, masks, the forms (``TransformerBlock``, ``FusedBlock``)
and ``convert`` between them."""
