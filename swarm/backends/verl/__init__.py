"""Scale-out adapter pieces for verl (Ray trainer, vLLM/SGLang rollout on GPUs).

What is here runs and is tested on CPU: turning the engine's token-exact samples into the
``DataProto`` batch verl's PPO trainer consumes (the same layout verl's own agent loop produces),
and mapping a ``TrainConfig`` onto verl's Hydra overrides. The GPU loop itself (verl's
``RayPPOTrainer`` fed by the swarm engine instead of its dataloader) needs GPUs and is not run here.
"""

from swarm.backends.verl.convert import samples_to_data_proto, verl_overrides

__all__ = ["samples_to_data_proto", "verl_overrides"]
