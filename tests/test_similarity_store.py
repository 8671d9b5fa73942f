"""The similarity index of lib (grader.copies._stored) is read from the tree once and kept in data/cache: what a later
process loads must be what reading gives, a damaged store must be read again, and a store made from other files must
never be used."""
import marshal

import pytest

from grader import copies


@pytest.fixture(scope="module")
def read_now():
    common = copies._read_common()
    return copies._read_lib_units(common), common


def _same(got, want):
    units, common = got
    assert common == want[1]
    assert units.keys() == want[0].keys()
    for name, unit in want[0].items():
        assert (units[name].kg, units[name].fp, units[name].st) == (unit.kg, unit.fp, unit.st), name


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setattr(copies, "STORE", tmp_path)
    copies._stored.cache_clear()
    yield tmp_path
    copies._stored.cache_clear()


def test_what_is_stored_loads_as_what_reading_gives(store, read_now):
    _same(copies._stored(), read_now)  # read, then stored
    [file] = store.glob("index-*.marshal")
    copies._stored.cache_clear()
    loaded = copies._stored()  # loaded
    _same(loaded, read_now)
    assert type(next(iter(loaded[0].values())).st).__name__ == "Counter"
    assert marshal.loads(file.read_bytes())  # plain data


def test_a_damaged_store_is_read_again(store, read_now):
    file = copies._store_file()
    store.mkdir(exist_ok=True)
    for junk in (b"", b"\x00garbage", marshal.dumps(({"x": (1, 2)}, (frozenset(), frozenset())))):
        file.write_bytes(junk)
        copies._stored.cache_clear()
        _same(copies._stored(), read_now)


def test_the_store_is_named_by_the_files_it_is_read_from(store, tmp_path, monkeypatch):
    assert {p.name for p in copies._index_sources()} >= {"copies.py", "similarity.py", "paged.py"}
    files = [tmp_path / "a.py", tmp_path / "b.py"]
    monkeypatch.setattr(copies, "_index_sources", lambda: files)
    names = set()
    for a, b in (("x = 1\n", "y = 2\n"), ("x = 1\n", "y = 3\n"), ("x = 1\ny", " = 2\n")):
        files[0].write_text(a)
        files[1].write_text(b)
        names.add(copies._store_file())
    assert len(names) == 3, "a store made from other files would be loaded"
