"""dflash-provision: provision SGLang DFlash / DDTree serving on Blackwell GPU boxes."""

__version__ = "0.1.0"
