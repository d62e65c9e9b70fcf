"""Weight transport: how each new policy version moves from the trainer to where it is served.

One interface, ``base.WeightTransport`` (``stage`` a version, deliver it, ``reset`` after a
failure), and three implementations, used as follows:

- ``transfer.DiskTransfer`` (``disk``): into a vLLM generator through a folder per version
  (``folder``: written whole, then reloaded in place by every vLLM worker). The default, and the
  only path without CUDA;
- ``transfer.NcclTransfer`` (``nccl``): into a vLLM generator on other GPUs, streamed over vLLM's
  NCCL engine by a ``WeightSender`` where the weights are (``LocalNcclSender`` in the server process
  for the torch trainer, ``verl_sender.VerlNcclSender`` in verl's FSDP workers; ``nccl`` is the
  stream, ``probe`` what a sender can do). ``transfer.choose_transfer`` picks disk or nccl and
  ``wiring`` applies the server's ``--weight-transfer`` to it;
- ``publish.Publisher`` (``relay``): to the pool's workers, as versioned, SHA-256-checked chunks
  (``shards``: a delta over the previous version or a full snapshot) pushed along a pipelined relay
  chain over HTTP (``relay``, ``chain``; ``bucket`` shapes each sender's upload).

What does not fit the interface, on purpose: a ``WeightSender`` is not a transport but the NCCL
source underneath ``NcclTransfer`` (blocking calls, no versions); the in-process torch generator
needs none (``swarm.local``: trainer and generator share the model, or the tensors are copied on
its device thread); a pool worker's catch-up ``relay.fetch`` pulls rather than being pushed to.
"""
