# Tests of the calls pipeline: a tenant's calls go at its limit's pace (10 a second, bursts of 2),
# in order, and none is lost; another tenant's calls are not held back by them. The stage reads at
# most a burst at a time and passes a batch on when its last call's turn has come, so acme's calls
# arrive in bursts of at most 2: the first 2 at once, then one every 100ms on average.

run "a tenant over its limit waits for its turn" {
  step {
    send {
      source = source.calls
      messages = [
        { id = "a1", tenant = "acme" },
        { id = "a2", tenant = "acme" },
        { id = "a3", tenant = "acme" },
        { id = "a4", tenant = "acme" },
        { id = "a5", tenant = "acme" },
        { id = "g1", tenant = "globex" },
      ]
    }
    advance = "50ms" # acme's third call is due at 100ms
    assert {
      condition     = length([for m in output.api : m if m.tenant == "acme"]) <= 2 && length([for m in output.api : m if m.tenant == "globex"]) == 1
      error_message = "at 50ms, no more than acme's burst has gone, and globex's call has gone"
    }
  }
  step {
    advance = "200ms" # at 250ms: the fourth call's turn was at 200ms, the fifth's is at 300ms
    assert {
      condition     = length([for m in output.api : m if m.tenant == "acme"]) >= 3 && length([for m in output.api : m if m.tenant == "acme"]) <= 4
      error_message = "at 250ms, acme's calls go at the limit's pace: three or four of them, never the fifth"
    }
  }
  step {
    # until the pipeline is drained: acme's fifth call goes at 300ms
    expect {
      sink = sink.api
      messages = [
        { id = "a1", tenant = "acme" },
        { id = "a2", tenant = "acme" },
        { id = "a3", tenant = "acme" },
        { id = "a4", tenant = "acme" },
        { id = "a5", tenant = "acme" },
        { id = "g1", tenant = "globex" },
      ]
    }
  }
  assert {
    condition     = metrics.throttle.in == 6 && metrics.throttle.out == 6 && metrics.throttle.retries == 0 && metrics.throttle.failed_attempts == 0
    error_message = "every call goes through, none fails or is retried: a wait is no failure"
  }
}
