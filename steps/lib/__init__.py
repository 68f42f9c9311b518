"""What the drill's pod commands share, never run on its own: the contract with Argo and the trainer
(contract), the trainer's evidence (evidence), the judgment (judge, trajectory, verdict), the report (report),
a multi-node trial's rounds (group), HF checkpoints (hf_checkpoint) and the local runner's pod registry
(local_pods)."""
