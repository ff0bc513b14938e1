"""`hpcmem calibrate`: a site measures hpcmem on its own GPUs, as SLURM job arrays, and installs the calibration.

    hpcmem calibrate --preset mycluster-h100 --dry-run     # the scripts, the cases with their predicted peaks
    hpcmem calibrate --preset mycluster-h100               # submit: arrays, multi-node jobs, the collect job
    hpcmem calibrate --status campaigns/mycluster-h100     # recorded, failed (why), in flight, missing
    hpcmem calibrate --collect campaigns/mycluster-h100    # what the collect job runs: fit, report, install

matrix    the cases for the preset's GPU (the GPU kit's cases, sized sweeps, the OOM boundary, multi-GPU layouts)
campaign  the campaign folder (its layout) and what its tasks recorded
scripts   the job scripts (templates/sbatch/calibrate.sh.j2), every value quoted
submit    planning and submission: what to run now, one array per GPU count, the collect job after all
task      one case inside its task: run, record, retry once, record the failure
collect   merge, fit, report, install into the site's data folder
"""
