"""The tasks: rotated moons or a user's table, checked and laid out for the models (``tasks``)."""
