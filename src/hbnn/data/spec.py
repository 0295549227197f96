"""What data a run asks for, as the data layer takes it (:class:`DataSpec`).

A stage turns its params into one :class:`DataSpec` (:meth:`DataSpec.of`) and hands that to
:func:`hbnn.data.tasks.make_tasks`, :func:`hbnn.data.moons.make_moons_tasks` or
:func:`hbnn.data.tables.frame_tasks`: the ``data`` section, the likelihood the labels must suit, the seed of the
moons and of a table's split, and the number of moons groups. The Python API builds the same spec for a user's
frame.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the data layer takes the section, never the whole params
    from hbnn.config import DataParams


@dataclass(frozen=True)
class DataSpec:
    """The tasks to make: where they come from, how they are split, what their labels must suit.

    Parameters
    ----------
    data : hbnn.config.DataParams
        The checked ``data`` params: the source, the moons' shape or the table's file and columns, the train
        fraction, whether to standardise.
    likelihood : str
        The registered likelihood (:mod:`hbnn.model.likelihoods`) a table's labels are checked against and
        stratified by.
    seed : int
        Seeds the moons and a table's split.
    n_groups : int
        The number of moons groups; a table's groups are its own.
    """

    data: DataParams
    likelihood: str
    seed: int
    n_groups: int

    @classmethod
    def of(cls, params) -> DataSpec:
        """The spec of checked params (:class:`hbnn.config.Params`).

        Parameters
        ----------
        params : hbnn.config.Params
            The run's params: ``data``, ``model.likelihood``, ``seed`` and ``n_groups`` are read.

        Returns
        -------
        DataSpec
        """
        return cls(params.data, params.model.likelihood, params.seed, params.n_groups)
