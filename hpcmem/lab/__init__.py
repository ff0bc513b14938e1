"""Tools that fit or study the shipped coefficients: run by hand, never imported by the product.

`python -m hpcmem.lab.<name>`; what each found is in estimator/LOG.md."""
