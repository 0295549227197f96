"""Diagnostics: R-hat and ESS (``convergence``), PSIS-LOO (``psis``), and predictions, scores and the convergence
criterion of a fit (``evaluation``)."""
