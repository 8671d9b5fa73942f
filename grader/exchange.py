"""nbgrader's exchange, as the lab collects from it (`nbgrader collect`, the formgrader's collect button).

`OwnerCheckedCollect`: nbgrader's collect, minus any submission folder not owned by the student it names. The
exchange's inbound folder is writable by every user (that is how students submit), and a submission is a folder
named `<student>+<assignment>+<timestamp>+<random>`: nbgrader's own collect warns when such a folder belongs to
another user ("cheating attempt?") and takes it anyway — the latest per student, so a folder forged in another
student's name with a later timestamp replaced that student's own work (tests/test_jupyterhub_class.py). Here the
forged folder is refused, with an error naming it, and the student's own latest submission is collected.
"""
from __future__ import annotations

import glob
import os
import pwd

from nbgrader.exchange.default.collect import ExchangeCollect


def _owner(path: str) -> str | None:
    try:
        return pwd.getpwuid(os.stat(path).st_uid).pw_name
    except (KeyError, OSError):
        return None


class OwnerCheckedCollect(ExchangeCollect):
    def init_src(self):
        super().init_src()  # its checks, paths and due date; the choice of submissions is made again below
        student = self.coursedir.student_id or "*"
        pattern = os.path.join(self.inbound_path, f"{student}+{self.coursedir.assignment_id}+*")
        records = []
        for path in sorted(glob.glob(pattern)):
            record = self._path_to_record(path)
            owner = _owner(path)
            if owner != record["username"]:
                self.log.error(f"refused {path}: it claims to be {record['username']}'s submission, but its owner is "
                               f"{owner}; that student's own submissions are collected")
                continue
            records.append(record)
        chosen = []
        for name in sorted({r["username"] for r in records}):
            mine = self._sort_by_timestamp([r for r in records if r["username"] == name])
            if self.duedate is not None and self.before_duedate:
                mine = [r for r in mine if r["timestamp"] <= self.duedate] or mine
            chosen.append(mine[0])
        self.src_records = chosen
