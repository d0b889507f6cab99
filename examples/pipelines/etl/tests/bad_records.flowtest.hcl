# Records the job cannot read. An expression that fails on a message (a field that is not there, a
# value of the wrong type) dead-letters it on its first attempt: no retry would change the outcome.
# The job goes on with the next records, those of the same customer included.

run "a completed order without items fails the filter" {
  send {
    source = source.export
    messages = [
      { id = 1, status = "completed", customer = { id = "c1", email = "a@example.com", country = "fr" } },
      { id = 2, status = "completed", customer = { id = "c1", email = "a@example.com", country = "fr" }, items = [{ sku = "S-1", price = 2, qty = 1 }] },
    ]
  }
  expect_dead_letters {
    stage = stage.completed
    count = 1
    messages = [{
      payload  = { id = 1, status = "completed", customer = { id = "c1", email = "a@example.com", country = "fr" } }
      reason   = "msg has no field \"items\""
      attempts = 1
    }]
  }
  expect {
    sink     = sink.clean
    messages = [{ key = "c1", payload = { order_id = "2", customer_id = "c1", email = "a@example.com", country = "FR", items = 1, total = 2, skus = "S-1" } }]
  }
}

run "records the normalise stage cannot compute are dead-lettered there" {
  send {
    source = source.export
    messages = [
      # A price that is not a number: the total cannot be computed.
      { id = 3, status = "completed", customer = { id = "c2", email = "b@example.com", country = "nl" }, items = [{ sku = "S-1", price = "n/a", qty = 1 }] },
      # coalesce fills in a null country, not a missing one.
      { id = 4, status = "completed", customer = { id = "c2", email = "b@example.com" }, items = [{ sku = "S-1", price = 2, qty = 1 }] },
      # trimspace takes no null.
      { id = 5, status = "completed", customer = { id = "c3", email = null, country = "nl" }, items = [{ sku = "S-1", price = 2, qty = 1 }] },
      { id = 6, status = "completed", customer = { id = "c2", email = "b@example.com", country = "nl" }, items = [{ sku = "S-1", price = 2, qty = 1 }] },
    ]
  }
  expect_dead_letters {
    stage = stage.normalise
    count = 3
    messages = [
      { payload = { id = 3, status = "completed", customer = { id = "c2", email = "b@example.com", country = "nl" }, items = [{ sku = "S-1", price = "n/a", qty = 1 }] }, reason = "a number is required", attempts = 1 },
      { payload = { id = 4, status = "completed", customer = { id = "c2", email = "b@example.com" }, items = [{ sku = "S-1", price = 2, qty = 1 }] }, reason = "msg.customer has no field \"country\"", attempts = 1 },
      { payload = { id = 5, status = "completed", customer = { id = "c3", email = null, country = "nl" }, items = [{ sku = "S-1", price = 2, qty = 1 }] }, reason = "argument must not be null", attempts = 1 },
    ]
  }
  expect {
    sink     = sink.clean
    messages = [{ key = "c2", payload = { order_id = "6", customer_id = "c2", email = "b@example.com", country = "NL", items = 1, total = 2, skus = "S-1" } }]
  }
  assert {
    condition     = metrics.normalise.retries == 0 && metrics.completed.dead_lettered == 0
    error_message = "an expression error is not retried, and the filter lets these orders through"
  }
}
