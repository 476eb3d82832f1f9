"""build_step_inputs: the flat tensors of one packed step, checked element by element."""

from __future__ import annotations

from bulkrun.engine.core.params import SamplingParams
from bulkrun.engine.core.request import Request
from bulkrun.engine.core.scoring import ScoringState
from bulkrun.engine.worker.step_inputs import build_step_inputs

BS = 4


def _req(rid, tokens, computed, table, score_start=None):
    r = Request(rid, SamplingParams(), list(tokens), len(tokens))
    r.num_computed_tokens, r.block_table = computed, list(table)
    if score_start is not None:
        r.scoring = ScoringState(score_start=score_start)
    return r


def test_positions_slots_and_lengths_of_a_mixed_step():
    decode = _req("d", range(100, 110), 9, [7, 2, 5])  # position 9 -> block 5, offset 1
    chunk = _req("c", range(200, 220), 6, [3, 9, 1, 0, 8])  # positions 6..12, starting mid-block
    fresh = _req("f", range(300, 303), 0, [4])
    inputs = build_step_inputs(
        [
            (decode, 1, True),
            (chunk, 7, False),
            (fresh, 3, True),
        ],
        BS,
    )
    md = inputs.metadata
    assert inputs.input_ids.tolist() == [109] + list(range(206, 213)) + [300, 301, 302]
    assert md.positions.tolist() == [9, 6, 7, 8, 9, 10, 11, 12, 0, 1, 2]
    expected_slots = (
        [5 * 4 + 1] + [9 * 4 + 2, 9 * 4 + 3, 1 * 4, 1 * 4 + 1, 1 * 4 + 2, 1 * 4 + 3, 0] + [16, 17, 18]
    )
    assert md.slot_mapping.tolist() == expected_slots
    assert md.query_start_loc.tolist() == [0, 1, 8, 11]
    assert md.seq_lens.tolist() == [10, 13, 3]
    assert md.block_tables.tolist() == [[7, 2, 5, 0, 0], [3, 9, 1, 0, 8], [4, 0, 0, 0, 0]]
    assert str(md.block_tables.dtype) == "torch.int32" and str(md.slot_mapping.dtype) == "torch.int64"
    # logits only for the rows that sample: the decode row and the fresh prompt's last row
    assert inputs.logits_indices.tolist() == [0, 10]
    assert [r.request_id for r in inputs.sample_requests] == ["d", "f"] and inputs.score_spans == []


def test_rotary_rows_of_requests_on_longrope_long_factors():
    short = _req("s", range(100, 110), 9, [7, 2, 5])
    long = _req("l", range(200, 240), 36, [3, 9, 1, 0, 8, 6, 4, 11, 12, 13])  # positions 36..38
    long.long_rope = True
    inputs = build_step_inputs([(short, 1, True), (long, 3, True)], BS, long_rope_after=32)
    md = inputs.metadata
    assert md.positions.tolist() == [9, 36, 37, 38]
    assert md.rope_rows.tolist() == [9, 32 + 36, 32 + 37, 32 + 38]  # the long rows follow the 32 short ones
    assert md.rotary_rows is md.rope_rows
    plain = build_step_inputs([(short, 1, True)], BS).metadata  # a model without LongRoPE
    assert plain.rope_rows is None and plain.rotary_rows is plain.positions


def test_score_spans_cover_exactly_the_scored_positions_of_each_chunk():
    # prompt of 5 + continuation of 3: scores token_ids[5], [6], [7] from positions 4, 5, 6
    first = _req("s", range(10, 18), 0, [1, 2], score_start=5)
    second = _req("t", range(20, 28), 0, [3, 4], score_start=5)
    generate = _req("g", range(40, 43), 0, [5])
    inputs = build_step_inputs(
        [
            (first, 6, False),
            (second, 8, False),
            (generate, 3, True),
        ],
        BS,
    )
    # sampled rows come first (g's last row = 16), then s's positions 4, 5 (rows 4, 5), t's 4..6 (rows 10..12)
    assert inputs.logits_indices.tolist() == [16, 4, 5, 10, 11, 12]
    s_span, t_span = inputs.score_spans
    assert (s_span.request.request_id, s_span.first_row, s_span.targets) == ("s", 1, [15, 16])
    assert (t_span.request.request_id, t_span.first_row, t_span.targets) == ("t", 3, [25, 26, 27])


def test_a_later_chunk_scores_only_its_own_positions():
    r = _req("s", range(50, 60), 6, [0, 1, 2], score_start=5)  # position 4 was scored by the first chunk
    inputs = build_step_inputs([(r, 4, False)], BS)
    assert inputs.logits_indices.tolist() == [0, 1, 2]  # positions 6, 7, 8; position 9 has no target
    assert inputs.score_spans[0].targets == [57, 58, 59]


def test_a_chunk_before_the_scored_part_asks_for_no_logits():
    r = _req("s", range(50, 60), 0, [0, 1, 2], score_start=8)
    inputs = build_step_inputs([(r, 4, False)], BS)
    assert inputs.logits_indices.tolist() == [] and inputs.score_spans == []
