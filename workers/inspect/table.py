"""The segments as one line per token (``titoflow inspect --table``), easy to diff and grep.

Invariant: every token of every step is one line, in order, with its position, id, loss mask,
logprob source, logprob (0.0 for context: a placeholder), weight version and step number; a
piece's text goes on its last token's line as a JSON string, so a line never breaks.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from workers.inspect.view import SegmentView, source_name


def render_table(views: Sequence[SegmentView]) -> str:
    """One line per token: position, id, mask, source, logprob, version, text."""
    out = []
    for view in views:
        segment = view.segment
        out.append(f"# segment {segment.segment_id} (session {segment.session_id})")
        out.append("pos\tid\tmask\tsource\tlogprob\tversion\tstep\ttext")
        for step in view.steps:
            for piece in step.context + step.completion:
                for i in range(piece.start, piece.end):
                    text = piece.text if i == piece.end - 1 else ""
                    out.append(
                        f"{i}\t{segment.token_ids[i]}\t{segment.loss_mask[i]}\t"
                        f"{source_name(segment.logprob_source[i])}\t"
                        f"{segment.logprobs[i]:.4f}\t{view.versions[i] or ''}\t"
                        f"{step.index + 1}\t{json.dumps(text, ensure_ascii=False)}"
                    )
    return "\n".join(out) + "\n"
