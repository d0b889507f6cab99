# Events the pipeline cannot handle are dead-lettered where they fail, on their first attempt (an
# expression error is not retried), and the other events of the same user go on.

run "an event without a type cannot be routed" {
  send {
    source = source.events
    messages = [
      { user = "user-1", seq = 1, page = "/", price = 10 },
      { user = "user-1", seq = 2, type = "purchase", page = "/", price = 10 },
    ]
  }
  expect_dead_letters {
    stage    = stage.by_type
    count    = 1
    messages = [{ payload = { user = "user-1", seq = 1, page = "/", price = 10 }, reason = "msg has no field \"type\"", attempts = 1 }]
  }
  expect {
    sink     = sink.purchases
    messages = [{ key = "user-1", payload = { user = "user-1", seq = 2, type = "purchase", page = "/", net = 10, gross = 11.9 } }]
  }
}

run "a purchase without a numeric price cannot be priced" {
  send {
    source = source.events
    messages = [
      { user = "user-2", seq = 3, type = "purchase", page = "/", price = "ten" },
      { user = "user-2", seq = 4, type = "purchase", page = "/" },
      { user = "user-2", seq = 5, type = "purchase", page = "/", price = 30 },
    ]
  }
  expect_dead_letters {
    stage = stage.price
    count = 2
    messages = [
      { payload = { user = "user-2", seq = 3, type = "purchase", page = "/", price = "ten" }, reason = "a number is required", attempts = 1 },
      { payload = { user = "user-2", seq = 4, type = "purchase", page = "/" }, reason = "msg has no field \"price\"", attempts = 1 },
    ]
  }
  expect {
    sink     = sink.purchases
    messages = [{ key = "user-2", payload = { user = "user-2", seq = 5, type = "purchase", page = "/", net = 30, gross = 35.7 } }]
  }
  assert {
    condition     = metrics.price.retries == 0 && metrics.by_type.dead_lettered == 0
    error_message = "the route passes the purchases on, and the price stage does not retry them"
  }
}

run "other branches do not look at the price" {
  # Only the price stage reads price: a sign-up or a click without one goes through.
  send {
    source = source.events
    messages = [
      { user = "user-3", seq = 6, type = "signup", page = "/" },
      { user = "user-3", seq = 7, type = "click", page = "/docs" },
    ]
  }
  expect {
    sink     = sink.signups
    messages = [{ key = "user-3", payload = { user = "user-3", seq = 6, type = "signup", page = "/" } }]
  }
  expect {
    sink     = sink.click_log
    messages = [{ key = "user-3", payload = { user = "user-3", seq = 7, type = "click", page = "/docs" } }]
  }
  assert {
    condition     = length(dead_letters.price) == 0 && length(dead_letters.clicks) == 0
    error_message = "nothing is dead-lettered"
  }
}
