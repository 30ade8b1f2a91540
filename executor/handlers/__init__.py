"""Op handlers: one function per kind of IR op, each given the rank's :class:`executor.state.RankState`.

A handler performs one op on real tensors and returns the issued communication (:class:`executor.comm.Pending`,
finished at the op's WAIT) or None. Handlers use only the state they are given and never import the
interpreter, which maps each op to its handler in one table (:data:`executor.interpreter.HANDLERS`):

* :mod:`.compute` - F, R, B, I, W on the named blocks;
* :mod:`.optimizer` - the OPT step and the offload's host <-> device transfers;
* :mod:`.p2p` - pipeline SEND and RECV;
* :mod:`.blockcomm` - tensor- and context-parallel collectives on the cuts of a block;
* :mod:`.gradsync` - data-parallel, parameter-server, ZeRO-1/2, tied-embedding and sequence-parallel
  gradient collectives;
* :mod:`.zero3` - ZeRO-3 parameter gathers, gradient reduce-scatters and the release at FREE;
* :mod:`.sync` - WAIT and barriers; :mod:`.memory` - ALLOC and FREE.
"""
