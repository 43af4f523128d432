from __future__ import annotations

import idem_client


def pytest_report_header() -> str:
    return f"idem_client {idem_client.__version__} from {idem_client.__file__}"
