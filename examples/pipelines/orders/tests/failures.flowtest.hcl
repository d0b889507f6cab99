# The two consumers are independent: an event that one of them cannot handle is dead-lettered there
# (on its first attempt: an expression error is not retried), and the other still gets it.

run "an event type without wording fails notifications only" {
  send {
    source = source.shop
    messages = [
      { type = "order.refunded", order_id = "3001", customer = "alice", amount = "42.50" },
      { type = "order.paid", order_id = "3001", customer = "alice", amount = "42.50" },
    ]
  }
  expect_dead_letters {
    stage    = stage.notifications
    count    = 1
    messages = [{ payload = { type = "order.refunded", order_id = "3001", customer = "alice", amount = "42.50" }, reason = "local.wording has no field \"order.refunded\"", attempts = 1 }]
  }
  # The order's next event is not held up by the failed one.
  expect {
    sink     = sink.notify
    messages = [{ key = "3001", payload = { type = "order.paid", order_id = "3001", customer = "alice", channel = "email", to = "alice", text = "Your order 3001 is paid." } }]
  }
  expect {
    sink = sink.reporting
    messages = [
      { key = "3001", payload = { order_id = "3001", customer = "alice", event = "order.refunded", amount_cents = 4250, cancelled = false } },
      { key = "3001", payload = { order_id = "3001", customer = "alice", event = "order.paid", amount_cents = 4250, cancelled = false } },
    ]
  }
}

run "an amount that is not a number fails analytics only" {
  send {
    source = source.shop
    messages = [
      { type = "order.paid", order_id = "3002", customer = "bob", amount = "9,99" },
      { type = "order.shipped", order_id = "3002", customer = "bob" },
    ]
  }
  expect_dead_letters {
    stage = stage.analytics
    count = 2
    messages = [
      { payload = { type = "order.paid", order_id = "3002", customer = "bob", amount = "9,99" }, reason = "cannot convert \"9,99\" to number", attempts = 1 },
      { payload = { type = "order.shipped", order_id = "3002", customer = "bob" }, reason = "msg has no field \"amount\"", attempts = 1 },
    ]
  }
  # Notifications do not need the amount, and drop it when there is one.
  expect {
    sink = sink.notify
    messages = [
      { key = "3002", payload = { type = "order.paid", order_id = "3002", customer = "bob", channel = "email", to = "bob", text = "Your order 3002 is paid." } },
      { key = "3002", payload = { type = "order.shipped", order_id = "3002", customer = "bob", channel = "sms", to = "bob", text = "Your order 3002 is on its way." } },
    ]
  }
  expect {
    sink  = sink.reporting
    count = 0
  }
}

run "an event of an order placed is worded but not sent" {
  # The notify sink's where filters it after the stage: it is counted as filtered, not failed.
  send {
    source   = source.shop
    messages = [{ type = "order.placed", order_id = "3003", customer = "carol", amount = "5" }]
  }
  expect {
    topic    = stage.notifications
    messages = [{ key = "3003", payload = { type = "order.placed", order_id = "3003", customer = "carol", channel = "email", to = "carol", text = "Your order 3003 is placed." } }]
  }
  expect {
    sink  = sink.notify
    count = 0
  }
  assert {
    condition     = metrics.notify.filtered == 1 && metrics.notify.dead_lettered == 0
    error_message = "the sink's where filters the order.placed event"
  }
}

run "an event that the topic's schema refuses is dead-lettered by the source" {
  # Without a customer, or with an order id that is not a number, an event is not an order event:
  # the source leaves it out of the topic, so neither consumer sees it, and says why.
  send {
    source = source.shop
    messages = [
      { type = "order.paid", order_id = "3004", amount = "5" },
      { type = "order.paid", order_id = "30x5", customer = "dan", amount = "5" },
      { type = "order.paid", order_id = "3006", customer = "erin", amount = "5" },
    ]
  }
  expect_dead_letters {
    source = source.shop
    count  = 2
    messages = [
      { payload = { type = "order.paid", order_id = "3004", amount = "5" }, reason = "topic orders: schema: /required: at /: missing property 'customer'", attempts = 1 },
      { payload = { type = "order.paid", order_id = "30x5", customer = "dan", amount = "5" }, reason = "topic orders: schema: /properties/order_id/pattern: at /order_id:", attempts = 1 },
    ]
  }
  expect {
    sink     = sink.notify
    messages = [{ key = "3006", payload = { type = "order.paid", order_id = "3006", customer = "erin", channel = "email", to = "erin", text = "Your order 3006 is paid." } }]
  }
}
