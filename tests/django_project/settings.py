"""A Django project using dygo (docs/guides/django.md); its database comes from DATABASE_URL."""

import os
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict

BASE_DIR = Path(__file__).resolve().parent.parent  # tests/, whose config/ holds queues.yml and dygo.yml
DATABASE = conninfo_to_dict(os.environ["DATABASE_URL"])

SECRET_KEY = "only-for-the-tests"
DEBUG = False
ALLOWED_HOSTS = ["testserver"]
USE_TZ = True
ROOT_URLCONF = "tests.django_project.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --8<-- [start:settings]
INSTALLED_APPS = [
    "dygo.contrib.django",  # manage.py dygo ..., and each app's jobs.py imported at start
    "tests.django_project.shop",
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",  # psycopg 3, which dygo installs
        "NAME": DATABASE["dbname"],
        "USER": DATABASE["user"],
        "HOST": DATABASE["host"],
    },
}

DYGO = {
    "DATABASE": "default",  # the alias `manage.py dygo` runs on (the default)
    "CONFIG_DIR": BASE_DIR / "config",  # queues.yml and dygo.yml
}
# --8<-- [end:settings]

DATABASES["legacy"] = {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}
