"""The verl trainer: verl's FSDP2 ``TrainingWorker``s on a Ray worker group, fed by the server.

``VerlTrainer`` implements the ``Trainer`` role (``swarm serve --trainer verl``); ``check_supported``
refuses, by name, any ``TrainConfig`` knob it cannot honour (call it at server start). Conversion
of the server's token-exact samples into verl's ``DataProto`` is ``samples_to_data_proto``;
``verl_overrides`` maps a ``TrainConfig`` onto verl's Hydra PPO config for verl's own GPU loop.
On CPU, ``cpu_platform`` supplies the small platform registration verl 0.9.1 needs (gloo). verl and
Ray are imported only when a trainer is built.
"""

from swarm.backends.verl.convert import samples_to_data_proto, verl_overrides
from swarm.backends.verl.knobs import check_supported
from swarm.backends.verl.trainer import VerlTrainer

__all__ = ["VerlTrainer", "check_supported", "samples_to_data_proto", "verl_overrides"]
