"""An auto table field of the wrong JSON type (issue 28, item 9) is refused like every other
malformed table: a ValueError whose message starts with the file and names the field (a
list as ``device`` raised ``TypeError: unhashable type`` naming neither)."""
from __future__ import annotations

import json
import re

import pytest

from transfer_kernels.backends import auto_table

HEAD = {"format": "hicache-auto-table", "version": 1}


@pytest.mark.parametrize("doc,field", [
    ({**HEAD, "rules": [{"device": ["cpu"], "use": "torch"}]}, "rules[0].device"),
    ({**HEAD, "rules": [{"device": {"cpu": 1}, "use": "torch"}]}, "rules[0].device"),
    ({**HEAD, "rules": [{"device": 1, "use": "torch"}]}, "rules[0].device"),
    ({**HEAD, "rules": [{"device": "cpu", "use": ["torch"]}]}, "rules[0].use"),
    ({**HEAD, "rules": [{"device": "cpu", "use": {"torch": 1}}]}, "rules[0].use"),
    ({**HEAD, "rules": [{"device": "cpu", "use": "torch", "path": ["dense"]}]}, "rules[0].path"),
    ({**HEAD, "rules": [{"device": "cpu", "use": "torch", "dir": {"h2d": 1}}]}, "rules[0].dir"),
    ({**HEAD, "rules": [{"device": "cpu", "use": "torch", "min_job_bytes": "1"}]}, "rules[0].min_job_bytes"),
    ({**HEAD, "rules": [{"device": "cpu", "use": "torch", "max_piece_bytes": 1.5}]}, "rules[0].max_piece_bytes"),
    ({**HEAD, "rules": [{"device": "cpu", "use": "torch"}, ["cpu", "torch"]]}, "rules[1]"),
    ({**HEAD, "rules": {"device": "cpu", "use": "torch"}}, "rules"),
    ({**HEAD, "source": ["x"], "rules": [{"device": "cpu", "use": "torch"}]}, "source"),
    ({"format": ["hicache-auto-table"], "version": 1, "rules": [{"device": "cpu", "use": "torch"}]},
     "format/version"),
    ({"format": "hicache-auto-table", "version": True, "rules": [{"device": "cpu", "use": "torch"}]},
     "format/version"),
])
def test_a_field_of_the_wrong_type_is_refused_naming_file_and_field(tmp_path, doc, field):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="^" + re.escape(f"{path}: {field}:")):
        auto_table.load(path)
