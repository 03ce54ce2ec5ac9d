import collections, json
from tests.server.test_fuzz import *  # noqa
STATS = collections.Counter()
BODIES = []

@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_dbg(case, small_server):
    if isinstance(case.body, dict) and isinstance(case.body.get("model"), str):
        case.body["model"] = MODEL
    r = case.call(base_url=small_server.url)
    STATS[(case.operation.label, r.status_code, r.json().get("error", {}).get("param") if r.headers.get("content-type","").startswith("application/json") and r.status_code>=400 else "")] += 1
    if case.operation.label.startswith("POST /v1/chat") and len(BODIES) < 5: BODIES.append(case.body)

def test_zzz():
    for k, v in sorted(STATS.items(), key=str): print(k, v)
    for b in BODIES: print(json.dumps(b)[:300])
