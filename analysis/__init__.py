"""What trained runs hold and how they learned, for RL and LM runs alike. The commands
(`python -m analysis.<module> --help`):

- `plot`: performance against average memory size, one point per run (figures 4 and 5), from
  `results` (what a run directory says of its run), `settings` (runs grouped by setting),
  `figures` and `tables`;
- `curves`: learning curves, and whether each run holds what it learns;
- `probes`: what an agent's memory holds on to (`train_rl.py mode=eval` reports them);
- `span_drift`: why a memory's expire-span moves between checkpoints;
- `collision_probe`: a collision model's accuracy by how far back the answer lies;
- `visualize`: a language model's spans over a text.
"""
