"""What `make demo` prints after the run: the default model's accuracy against the shipped tickets'
gold labels, calibrated (the default) and raw, and a few results. Reads the job through the Python
API: `python jobs/demo_accuracy.py runs/demo`."""

import sys

import pandas as pd

import bulkrun

out = sys.argv[1] if len(sys.argv) > 1 else "runs/demo"
results = bulkrun.results(out)
gold = pd.read_json("bulkrun/data/tickets.jsonl", lines=True)[["id", "label"]]
joined = results.merge(gold.rename(columns={"label": "gold"}), on="id")
accuracy = (joined["label"] == joined["gold"]).mean()
print(f"accuracy against the gold labels: {accuracy:.0%} of {len(joined)} tickets (calibrated, the default)")
if "raw_label" in joined:
    print(f"without calibration (raw_label):  {(joined['raw_label'] == joined['gold']).mean():.0%}")
    prior = bulkrun.metrics(out)["calibration"]["prior"]
    print("content-free prior: " + ", ".join(f"{k} {v:.2f}" for k, v in prior.items()))
print()
for row in joined.head(10).itertuples():
    mark = "ok" if row.label == row.gold else f"gold {row.gold}"
    print(f"{row.id:>6}  {row.label:<9} p={row.probability:.2f}  {mark:<14} {row.text[:60]}")
