"""The door for a project's settings: what its ``settings.py`` imports and its ``LOGGING``
names, so a project names no private module of the app.

- Reading 12-factor settings: ``load_env_file`` (fills in variables from a file without
  overriding the environment), ``env_bool``, ``env_int``, ``env_float``, ``env_list``, and
  ``parse_database_url`` (dj-database-url's parser, refusing what the work ledger cannot use).
- Logging: ``JsonFormatter`` (one JSON object per line, ``LOG_FORMAT=json``) and the
  ``RunFields`` filter that puts a run's key on every line logged during it; a project's
  ``LOGGING`` names them as ``"reconcilers.conf.JsonFormatter"`` and
  ``"reconcilers.conf.RunFields"``.

Nothing here reads Django's settings, so a settings module can import it before it defines any.
The operator's own ``RECONCILERS_*`` settings are set as plain Django settings or environment
variables (docs/running/configuration.md); nothing needs importing for them.
"""

from reconcilers._base.environ import (env_bool, env_float, env_int, env_list, load_env_file,
                                       parse_database_url)
from reconcilers._base.logs import JsonFormatter, RunFields

__all__ = ["JsonFormatter", "RunFields", "env_bool", "env_float", "env_int", "env_list",
           "load_env_file", "parse_database_url"]
