"""A policy on k ranks: one ``torch.distributed`` process group per policy (:mod:`.group`), its model sharded
with FSDP2 (:mod:`.fsdp`), its rows split over the ranks (:mod:`.split`) and its update normalised by global
counts (:mod:`.share`), its checkpoints gathered to the full fp32 weights (:mod:`.checkpoint`)."""
