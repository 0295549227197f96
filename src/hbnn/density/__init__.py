"""The fast density: the hand-written log density and gradient of the three models (``kernel``), nutpie's callbacks
around it (``callbacks``), the code written out per network (``written``) and the integrity of numba's cache of it
(``cache_guard``)."""
