"""The model specification: the network's layout and forward passes, the likelihoods, PyMC's model builders and the
informed prior."""
