"""Pictures of where the memory goes: an estimate's phases, a trace's timeline, a plan's search (PNG, matplotlib).

matplotlib is optional: the light install estimates, plans and submits without it, and asking it for a picture gives
a one-line message that says how to get one (`hpcmem.plots.mpl.pyplot`).
"""
