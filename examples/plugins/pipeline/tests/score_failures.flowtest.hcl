# acme.score, mocked to fail: a permanent error dead-letters the order at once; a transient one that
# does not go away dead-letters it after the default retry policy's three attempts.

mock "acme.score" {
  result {
    error     = "order rejected by the scoring rules"
    permanent = true
  }
  result {
    error = "scoring service unavailable" # the last result: every later call gets it
  }
}

run "a permanent error is dead-lettered without a retry" {
  send {
    source   = source.orders
    messages = [{ id = 1, customer = "alice", amount = 120, country = "DE" }]
  }
  expect_dead_letters {
    stage    = stage.score
    count    = 1
    messages = [{ payload = { id = 1, customer = "alice", amount = 120, country = "DE" }, reason = "order rejected by the scoring rules", attempts = 1 }]
  }
  assert {
    condition     = metrics.score.retries == 0
    error_message = "a permanent error is not retried"
  }
}

run "a transient error that persists is dead-lettered after three attempts" {
  send {
    source   = source.orders
    messages = [{ id = 2, customer = "bob", amount = 2400, country = "FR" }]
  }
  expect_dead_letters {
    stage    = stage.score
    count    = 1
    messages = [{ payload = { id = 2, customer = "bob", amount = 2400, country = "FR" }, reason = "scoring service unavailable", attempts = 3 }]
  }
  expect {
    sink  = sink.review
    count = 0
  }
  expect {
    sink  = sink.review_sheet
    count = 0
  }
  assert {
    condition     = metrics.score.retries == 2
    error_message = "the order is tried three times in all"
  }
}
