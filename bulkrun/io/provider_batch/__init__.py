"""Provider batch files: a job's requests written for a provider's batch tier, and its results read back.

    export:  BatchRequest(row, id, messages) ─▶ write_batch(...) ─▶ DIR/<provider>-NNNNN.jsonl
                                                                   DIR/custom_ids.jsonl, DIR/batch.json
    import:  the provider's result files ─▶ read_results(paths, id_map, n) with load_export(DIR) ─▶ RowAssembler
             ─▶ result records (row, id, text, finish_reason, token counts) and error records

Formats (field names as each provider documents them):
- OpenAI Batch API: request lines {custom_id, method, url, body}, output/error lines
  {id, custom_id, response: {status_code, request_id, body}, error: {code, message}} (`openai.py`).
- Anthropic Message Batches: requests {custom_id, params} (the `requests` array of a batch, one per
  line), results lines {custom_id, result: {type: succeeded|errored|canceled|expired, ...}}
  (`anthropic.py`).
Stdlib only: no provider SDK is needed to write or read these files.
"""

from bulkrun.io.provider_batch.custom_ids import IdMap
from bulkrun.io.provider_batch.model import (
    BatchError,
    BatchRequest,
    BatchSampling,
    ExportExists,
    ProviderBatchError,
    ResponseFormat,
    SampleResult,
    UnsupportedOption,
)
from bulkrun.io.provider_batch.results import RowAssembler, load_export, read_results
from bulkrun.io.provider_batch.writer import PROVIDERS, BatchExport, write_batch

__all__ = [
    "PROVIDERS",
    "BatchError",
    "BatchExport",
    "BatchRequest",
    "BatchSampling",
    "ExportExists",
    "IdMap",
    "ProviderBatchError",
    "ResponseFormat",
    "RowAssembler",
    "SampleResult",
    "UnsupportedOption",
    "load_export",
    "read_results",
    "write_batch",
]
