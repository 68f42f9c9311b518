"""baton's trainer: everything that runs inside one training process (one rank)."""
