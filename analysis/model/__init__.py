"""A calibrated model of one training iteration, for what one machine cannot show at scale.

* `replay`: the discrete-event replay (SimPy) of one iteration of one job on given hardware;
* `multirack`: the same with phub's racks on the wire (a PBox per rack, reduce-scatter and
  all-gather between them);
* `traffic`: what an exchange is made of (groups, placement, units, counts per role);
* `calibrate`: CPU costs per (system, role), fitted from the software-cost rows;
* `scenarios`: result rows and the paper's setup as the replay's jobs and machines;
* `validate`: predictions against this run's emulated and software-cost points, and at the
  paper's scale;
* `section`: the report's markdown section (`model_section(runs, softcost, ref)`).

Its rows are derived, never measured.
"""
from .calibrate import fit, load_softcost
from .replay import Costs, Job, Machine, RoleCosts, simulate
from .section import model_section

__all__ = ["Costs", "Job", "Machine", "RoleCosts", "simulate", "fit", "load_softcost", "model_section"]
