"""The package version, in one place: `vitfast.__version__`, setup.py and the files vitfast writes read it."""
__version__ = "0.1.0"
