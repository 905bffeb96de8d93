__all__ = ['ttypes', 'constants', 'Foqs']
