"""DATABASE_DIRECT_URL / DYGO_POOL_MODE: how dygo knows DATABASE_URL goes through a transaction pooler."""

import pytest
from dygo.store import db
from dygo.store.errors import ConfigError


def test_direct_url_says_database_url_is_a_transaction_pooler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DYGO_POOL_MODE", raising=False)
    monkeypatch.delenv("DATABASE_DIRECT_URL", raising=False)
    assert db.connect_kwargs() == {}
    monkeypatch.setenv("DATABASE_DIRECT_URL", "postgresql://postgres@127.0.0.1:5432/app")
    assert db.direct_url() == "postgresql://postgres@127.0.0.1:5432/app"
    assert db.connect_kwargs() == {"prepare_threshold": None}


def test_pool_mode_overrides_and_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_DIRECT_URL", "postgresql://postgres@127.0.0.1:5432/app")
    monkeypatch.setenv("DYGO_POOL_MODE", "session")
    assert not db.through_transaction_pooler()
    monkeypatch.delenv("DATABASE_DIRECT_URL")
    monkeypatch.setenv("DYGO_POOL_MODE", "Transaction")
    assert db.connect_kwargs() == {"prepare_threshold": None}
    monkeypatch.setenv("DYGO_POOL_MODE", "statement")
    with pytest.raises(ConfigError, match="DYGO_POOL_MODE.*'session' or 'transaction'"):
        db.through_transaction_pooler()
