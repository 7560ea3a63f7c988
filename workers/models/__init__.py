"""Models behind one small interface (see base.py); the registry names them."""
