# acme.score, mocked: it fails twice with a transient error (the scoring service is down, say), then
# scores the order. The stage has the default retry policy, three attempts in all.

mock "acme.score" {
  result {
    error = "scoring service unavailable"
    times = 2
  }
  result {
    output = merge(msg, { risk = 80 })
  }
}

run "a transient error is retried until the order is scored" {
  send {
    source   = source.orders
    messages = [{ id = 1, customer = "alice", amount = 120, country = "DE" }]
  }
  expect {
    sink     = sink.review
    messages = [{ key = "alice", payload = { id = 1, customer = "alice", amount = 120, country = "DE", risk = 80 } }]
  }
  assert {
    condition     = metrics.score.retries == 2 && metrics.score.dead_lettered == 0
    error_message = "the order is retried twice and then scored"
  }
}

run "an order waiting for its retry survives a crash" {
  reset = true # the mock starts again from its first result
  send {
    source   = source.orders
    messages = [{ id = 2, customer = "bob", amount = 2400, country = "FR" }]
  }
  advance = "50ms" # the first attempt has failed; the retry waits for its backoff
  step {
    crash = true # the process dies; another takes the partition over once the lease expires
  }
  expect {
    sink     = sink.review
    messages = [{ key = "bob", payload = { id = 2, customer = "bob", amount = 2400, country = "FR", risk = 80 } }]
  }
  expect_dead_letters {
    stage = stage.score
    count = 0
  }
}
