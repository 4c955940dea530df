"""Run-log analysis for the speedrun: parsing, statistics, plots, reports and record packaging.

Command line: python -m analysis summarize|compare|record-check|plot|report|record ... (see analysis/README.md)."""
