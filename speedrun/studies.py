"""The bundled studies, each declared in its own module (speedrun/study.py says what a study declares), in the
order their flags appear in --help and their parts in a default variant name."""

from speedrun.backout import BACKOUT
from speedrun.dlo import DLO
from speedrun.gated_skip import GATED_SKIP
from speedrun.laurel import LAUREL
from speedrun.rolling_skip import ROLLING_SKIP

# One entry a line: an export keeps the lines of the studies its run switches on (speedrun.export.prune_registry).
STUDIES = (
    BACKOUT,
    ROLLING_SKIP,
    LAUREL,
    DLO,
    GATED_SKIP,
)
# The studies whose flags the command line offers: all of them. An exported file whose studies are all fixed
# offers none (speedrun.study.FIXED_STUDIES: docs/export.md, rule 16), so its command line has no study code.
OFFERED_STUDIES = STUDIES
