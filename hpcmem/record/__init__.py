"""Probe records: the one typed, versioned record type and its files, shared by probe, validate and calibrate.

`Record` (hpcmem.record.types) is what a probe writes and every reader reads; `read_records` / `append_record`
(hpcmem.record.files) move it through JSONL files; hpcmem.record.job turns the job spec into data and back. Stdlib
only: validating and calibrating never import torch, and nothing here imports hpcmem.probe or hpcmem.validate.
"""

from hpcmem.record.files import append_record, read_all, read_lines, read_records, records_path
from hpcmem.record.job import (
           expandable_in_env,
           job_from_dict,
           job_to_dict,
           package_versions,
           ran_expandable,
           relevant_env,
)
from hpcmem.record.types import PEAK_KEYS, SCHEMA, GpuInfo, Measured, Oom, Record, RecordError, RunInfo

__all__ = ["PEAK_KEYS", "SCHEMA", "GpuInfo", "Measured", "Oom", "Record", "RecordError", "RunInfo", "append_record",
           "expandable_in_env", "job_from_dict", "job_to_dict", "package_versions",
           "ran_expandable", "read_all", "read_lines", "read_records", "records_path", "relevant_env"]
