"""SLURM time limits read exactly as SLURM reads them, so what hpcmem checks is what the scheduler applies.

The rules are SLURM's own (src/common/parse_time.c, 22.05 and later):
- `time_str2secs`: "-1", "INFINITE" and "UNLIMITED" (any case) mean no limit. Otherwise `_is_valid_timespec` allows
  only digits, at most one '-' (never after a ':') and at most two ':', with enough digit groups: M, M:S, H:M:S,
  D-H, D-H:M, D-H:M:S. Then `sscanf("%d-%d:%d:%d")` with a dash, `"%d:%d:%d"` without; two fields are M:S.
  A leading '-' is read as a negative day count ("-5" is minus five days).
- `time_str2mins` rounds seconds up to whole minutes.
- `arg_set_time_limit` (src/common/slurm_opt.c): 0 minutes means no limit (INFINITE); a negative result other
  than INFINITE is kept as it is and then stands for a huge unsigned number, which no partition limit admits —
  hpcmem refuses it instead.

The text is written to `#SBATCH --time` as given (it is only digits, '-' and ':' or one of the words), never
reformatted; `TimeLimit.minutes` is the value SLURM will apply, None for no limit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

UNLIMITED_WORDS = ("-1", "infinite", "unlimited")
INT_MAX = 2**31 - 1                    # time_str2secs adds C ints: a larger total overflows in SLURM itself
_CHARS = re.compile(r"[0-9:-]+")


@dataclass(frozen=True)
class TimeLimit:
    text: str                          # as the user or the preset wrote it (what #SBATCH --time gets)
    minutes: int | None                # what SLURM applies; None: no limit

    @property
    def unlimited(self) -> bool:
        return self.minutes is None

    def describe(self) -> str:
        """D-HH:MM:SS of the applied limit (or UNLIMITED), after the text when SLURM reads it as something else."""
        if self.minutes is None:
            meaning = "UNLIMITED"
        else:
            d, rest = divmod(self.minutes, 1440)
            meaning = f"{d}-{rest // 60:02d}:{rest % 60:02d}:00" if d else f"{rest // 60:02d}:{rest % 60:02d}:00"
        return self.text if self.text == meaning else f"{self.text} (= {meaning})"

    def fits_within(self, limit: TimeLimit) -> bool:
        if limit.minutes is None:
            return True
        return self.minutes is not None and self.minutes <= limit.minutes


def _valid_timespec(s: str) -> bool:
    """parse_time.c `_is_valid_timespec`: character set, separator counts and digit groups."""
    if not _CHARS.fullmatch(s):
        return False
    if ":" in s and "-" in s[s.index(":"):]:
        return False                   # a dash after a colon
    digits = len(re.findall(r"[0-9]+", s))
    dashes, colons = s.count("-"), s.count(":")
    if dashes > 1 or colons > 2:
        return False
    need = {0: 1, 1: 3, 2: 4} if dashes else {0: 1, 1: 2, 2: 3}
    return digits >= need[colons]


def _scan(s: str, pattern: str) -> list[int]:
    """sscanf with "%d" fields separated by the literal characters of `pattern`; stops at the first mismatch."""
    out: list[int] = []
    pos = 0
    for i, sep in enumerate(pattern):
        m = re.compile(r"[+-]?[0-9]+").match(s, pos)
        if not m:
            break
        out.append(int(m.group()))
        pos = m.end()
        if i == len(pattern) - 1 or pos >= len(s) or s[pos] != sep:
            break
        pos += 1
    return out


def _seconds(s: str) -> int:
    if "-" in s:
        d, h, m, sec = (_scan(s, "-::x") + [0, 0, 0, 0])[:4]
        return d * 86400 + h * 3600 + m * 60 + sec
    fields = _scan(s, "::x")
    if len(fields) == 3:
        h, m, sec = fields
        return h * 3600 + m * 60 + sec
    m, sec = (fields + [0, 0])[:2]      # minutes[:seconds]
    return m * 60 + sec


def parse(text: str) -> TimeLimit:
    """A SLURM time limit; ValueError (one line: the text and the rule) where SLURM would refuse it or overflow."""
    if not isinstance(text, str):
        raise ValueError(f"time limit {text!r} must be text such as \"90\", \"12:00:00\" or \"2-00:00:00\"")
    if text.lower() in UNLIMITED_WORDS:
        return TimeLimit(text, None)
    if not _valid_timespec(text):
        raise ValueError(f"time limit {text!r} is not a SLURM time: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S or UNLIMITED "
                         "(digits, one '-' before any ':', at most two ':')")
    if any(len(g) > 10 for g in re.findall(r"[0-9]+", text)):
        raise ValueError(f"time limit {text!r} is too large for SLURM (it counts seconds in a C int)")
    seconds = _seconds(text)
    if seconds < 0:
        raise ValueError(f"time limit {text!r} is negative; SLURM takes -1 (UNLIMITED) and no other negative limit")
    if seconds > INT_MAX - 59:
        raise ValueError(f"time limit {text!r} is too large for SLURM (it counts seconds in a C int)")
    minutes = (seconds + 59) // 60
    return TimeLimit(text, minutes or None)       # 0 minutes: SLURM applies no limit (slurm_opt.c)
