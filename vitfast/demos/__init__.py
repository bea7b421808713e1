"""Demos and studies behind CLI commands: `vitfast demo` (demo.py), `vitfast distill-demo` (distill_demo.py), the
non-deep comparison (nondeep_demo.py) and the USDC study (usdc_study.py).  They train small models on
scikit-learn's bundled digits images and use only the public library."""
