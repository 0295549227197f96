"""Hidden-unit alignment of chains: the symmetries of an MLP and the matching that undoes them.

An MLP computes the same function after permuting the units of a hidden
layer, and, where its activation is odd (tanh: ``f(-x) = -f(x)``,
:attr:`hbnn.model.activations.base.Activation.sign_symmetric`), after flipping
the sign of one unit (its incoming column and outgoing row both change sign).
Different chains can therefore sit in equivalent but differently labelled
modes, and pooling their weights unaligned blurs the informed prior (:mod:`hbnn.model.prior`) towards zero.
:func:`align_to_reference` finds, per chain, the permutation (and, where they
are a symmetry, the signs) of every hidden layer that best match a reference
chain (Hungarian matching on the chain-mean group weights ``mu``) and
:func:`apply_symmetry` applies them to every draw. For an activation that is
not odd (relu) only permutations are tried. Like the prior's derivation, the matching calls no BLAS and
sums in a fixed order, so it gives the same result on any x86-64 machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hbnn.model.prior import fixed_mean, fixed_sum


@dataclass(frozen=True)
class Symmetry:
    """A relabelling of an MLP's hidden units, which leaves the network function unchanged.

    Parameters
    ----------
    perm : tuple of numpy.ndarray
        Per hidden layer ``k``: ``perm[k][j]`` is the source unit placed at ``j``.
    sign : tuple of numpy.ndarray
        Per hidden layer ``k``: ``sign[k][j]`` is +-1, the sign unit ``j`` takes.
    """

    perm: tuple[np.ndarray, ...]
    sign: tuple[np.ndarray, ...]

    @staticmethod
    def identity(hidden_layers: Sequence[int]) -> Symmetry:
        """The relabelling that changes nothing, for hidden layers of these sizes.

        Parameters
        ----------
        hidden_layers : sequence of int
            Units per hidden layer.

        Returns
        -------
        Symmetry
        """
        return Symmetry(tuple(np.arange(h) for h in hidden_layers), tuple(np.ones(h) for h in hidden_layers))

    @property
    def is_identity(self) -> bool:
        """Whether the relabelling changes nothing."""
        return all((p == np.arange(p.size)).all() for p in self.perm) and all((s == 1).all() for s in self.sign)


def apply_symmetry(weights: Sequence[np.ndarray], sym: Symmetry) -> list[np.ndarray]:
    """Relabel hidden units of an MLP; the network function is unchanged.

    Hidden layer ``k`` sits between weight matrix ``k`` (its columns) and ``k + 1`` (its rows; the output
    vector for the last hidden layer).

    Parameters
    ----------
    weights : sequence of numpy.ndarray
        The layers as :func:`hbnn.model.network.layer_specs` lays them out, with any leading batch dims.
    sym : Symmetry
        The relabelling.

    Returns
    -------
    list of numpy.ndarray
        Relabelled copies of the layers.
    """
    out = [np.array(w, copy=True) for w in weights]
    for k, (perm, sign) in enumerate(zip(sym.perm, sym.sign, strict=True)):
        # Incoming: columns of matrix k (a bias row moves and flips with its unit's column).
        out[k] = out[k][..., perm] * sign
        # Outgoing: rows of matrix k + 1 (or entries of the output vector); a last, bias row stays.
        nxt, units = out[k + 1], perm.size
        if k + 1 == len(out) - 1:
            out[k + 1] = np.concatenate([nxt[..., perm] * sign, nxt[..., units:]], axis=-1)
        else:
            out[k + 1] = np.concatenate([nxt[..., perm, :] * sign[:, None], nxt[..., units:, :]], axis=-2)
    return out


def min_cost_assignment(cost: np.ndarray) -> np.ndarray:
    """The permutation of a square cost matrix's columns that minimises the total cost: the Hungarian algorithm.

    Kuhn-Munkres with row and column potentials, one shortest augmenting path per row, O(n^3): SciPy's
    ``linear_sum_assignment``'s permutation where the optimum is unique, an optimal one where costs tie
    (tested), without importing ``scipy.optimize``, whose import costs more than matching a few units
    (benchmarks/FINDINGS.md, "Start-up imports, the report's order, and a centred output layer").

    Parameters
    ----------
    cost : numpy.ndarray
        A square matrix of finite costs.

    Returns
    -------
    numpy.ndarray
        ``perm`` minimising ``sum(cost[j, perm[j]])``.

    Raises
    ------
    ValueError
        As SciPy's, for a matrix that is not square or not finite.
    """
    cost = np.asarray(cost, dtype=float)
    if cost.ndim != 2 or cost.shape[0] != cost.shape[1]:
        raise ValueError(f"the cost matrix must be square, not of shape {cost.shape}")
    if not np.isfinite(cost).all():
        raise ValueError("the cost matrix contains invalid numeric entries (NaN or infinite)")
    n = cost.shape[0]
    u, v = np.zeros(n + 1), np.zeros(n + 1)  # potentials of rows and columns (1-based; column 0 is the root)
    row_of = np.zeros(n + 1, dtype=np.int64)  # the row matched to each column, 0: none
    for i in range(1, n + 1):
        row_of[0] = i
        j0 = 0
        reduced = np.full(n + 1, np.inf)  # least reduced cost of reaching each column from the tree
        came_from = np.zeros(n + 1, dtype=np.int64)
        used = np.zeros(n + 1, dtype=bool)
        while True:
            used[j0] = True
            i0 = row_of[j0]
            here = cost[i0 - 1] - u[i0] - v[1:]
            closer = ~used[1:] & (here < reduced[1:])
            reduced[1:][closer] = here[closer]
            came_from[1:][closer] = j0
            j1 = 1 + int(np.argmin(np.where(used[1:], np.inf, reduced[1:])))
            delta = reduced[j1]
            u[row_of[used]] += delta
            v[used] -= delta
            reduced[~used] -= delta
            j0 = j1
            if row_of[j0] == 0:
                break
        while j0:  # the augmenting path, back to the root
            j1 = came_from[j0]
            row_of[j0] = row_of[j1]
            j0 = j1
    perm = np.empty(n, dtype=np.int64)
    perm[row_of[1:] - 1] = np.arange(n)
    return perm


def match_symmetry(reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray], signs: bool = True
                   ) -> Symmetry:
    """The symmetry that maps ``candidate`` weights closest to ``reference``.

    Both are single networks (no batch dims), with or without bias rows (a unit's bias counts as one of its
    incoming weights). Layers are matched in order: units
    of hidden layer ``k`` are compared by their incoming weights (after aligning
    layer ``k - 1``) plus their outgoing weights sorted (by absolute value where
    signs may flip), which do not depend on how later layers are labelled; for the last hidden
    layer the signed outgoing weight is used directly. With ``signs`` each unit pair takes the
    sign that fits best (a symmetry of odd activations only); without, every sign stays +1. The Hungarian
    algorithm picks the permutation.

    Parameters
    ----------
    reference : sequence of numpy.ndarray
        The network to match, per layer.
    candidate : sequence of numpy.ndarray
        The network to relabel, per layer.
    signs : bool, optional
        Whether a unit's sign flip is a symmetry (odd activations).

    Returns
    -------
    Symmetry
        The relabelling of ``candidate``.
    """
    n_hidden = len(reference) - 1
    current = [np.asarray(w, dtype=float) for w in candidate]
    perms, flips = [], []
    for k in range(n_hidden):
        ref_in, cand_in = reference[k], current[k]  # (..., units) columns
        ref_sig = ref_in.reshape(-1, ref_in.shape[-1]).T
        cand_sig = cand_in.reshape(-1, cand_in.shape[-1]).T
        last = k + 1 == n_hidden
        units = ref_in.shape[-1]  # the next layer's rows past these are its bias row
        if last:
            ref_sig = np.hstack([ref_sig, reference[k + 1][:units, None]])
            cand_sig = np.hstack([cand_sig, current[k + 1][:units, None]])
            extra = 0.0
        else:
            fold = np.abs if signs else np.asarray  # the next layer's units may flip sign: compare magnitudes
            ref_out = np.sort(fold(reference[k + 1][:units]), axis=1)
            cand_out = np.sort(fold(current[k + 1][:units]), axis=1)
            extra = _squared_sum(ref_out[:, None, :] - cand_out[None, :, :])
        plus = _squared_sum(ref_sig[:, None, :] - cand_sig[None, :, :])
        if signs:
            minus = _squared_sum(ref_sig[:, None, :] + cand_sig[None, :, :])
            cost = np.minimum(plus, minus) + extra  # cost[j, i]: ref unit j vs candidate unit i
            perm = min_cost_assignment(cost)
            sign = np.where(minus[np.arange(perm.size), perm] < plus[np.arange(perm.size), perm], -1.0, 1.0)
        else:
            perm = min_cost_assignment(plus + extra)
            sign = np.ones(perm.size)
        step = Symmetry(
            tuple(perm if i == k else np.arange(current[i].shape[-1]) for i in range(n_hidden)),
            tuple(sign if i == k else np.ones(current[i].shape[-1]) for i in range(n_hidden)),
        )
        current = apply_symmetry(current, step)
        perms.append(perm)
        flips.append(sign)
    # A layer's relabelling leaves other layers' units alone, so the per-layer
    # matches (each made after earlier layers were aligned) combine directly.
    return Symmetry(tuple(perms), tuple(flips))


@dataclass
class Alignment:
    """Aligned group-mean draws and what was done to each chain.

    Parameters
    ----------
    mu : list of numpy.ndarray
        Per layer, the aligned draws ``(chain, draw, *shape)``.
    symmetries : list of Symmetry
        Per chain, the relabelling applied.
    distance_before : list of float
        Per chain, the distance of its mean weights to the reference chain's before alignment.
    distance_after : list of float
        The same after alignment.
    """

    mu: list[np.ndarray]  # per layer (chain, draw, *shape), aligned
    symmetries: list[Symmetry]  # per chain
    distance_before: list[float]  # per chain, chain-mean distance to reference
    distance_after: list[float]


def align_to_reference(mu: Sequence[np.ndarray], reference_chain: int = 0, signs: bool = True) -> Alignment:
    """Align every chain's group-mean weights to ``reference_chain``.

    The match is made on chain means and applied to every draw of the chain.

    Parameters
    ----------
    mu : sequence of numpy.ndarray
        Per layer, the draws ``(chain, draw, *layer.shape)``.
    reference_chain : int, optional
        The chain the others are aligned to.
    signs : bool, optional
        Whether a unit's sign flip is a symmetry (:func:`match_symmetry`).

    Returns
    -------
    Alignment
        The aligned draws and each chain's relabelling and distances.

    Raises
    ------
    ValueError
        If ``reference_chain`` is not a chain of ``mu``.
    """
    n_chains = mu[0].shape[0]
    if not 0 <= reference_chain < n_chains:
        raise ValueError(f"reference_chain={reference_chain} but the trace has {n_chains} chains")
    ref_mean = [fixed_mean(m[reference_chain]) for m in mu]
    aligned = [np.empty_like(m) for m in mu]
    syms, before, after = [], [], []
    for c in range(n_chains):
        chain_mean = [fixed_mean(m[c]) for m in mu]
        sym = match_symmetry(ref_mean, chain_mean, signs)
        for layer, w in enumerate(apply_symmetry([m[c] for m in mu], sym)):
            aligned[layer][c] = w
        moved = apply_symmetry(chain_mean, sym)
        before.append(_distance(ref_mean, chain_mean))
        after.append(_distance(ref_mean, moved))
        syms.append(sym)
    return Alignment(aligned, syms, before, after)


def _squared_sum(d: np.ndarray) -> np.ndarray:
    """``(d ** 2).sum(-1)`` in :func:`fixed_sum`'s order."""
    return fixed_sum(d * d, axis=-1)


def _distance(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> float:
    """Euclidean distance between two networks' weights, all layers together."""
    flat = np.concatenate([(np.asarray(x) - np.asarray(y)).reshape(-1) for x, y in zip(a, b, strict=True)])
    return float(np.sqrt(_squared_sum(flat)))
