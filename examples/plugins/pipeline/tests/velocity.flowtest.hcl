# ACME's stateful function acme.velocity (run with flowrun-acme, which has it) passes on an order
# that is at least its customer's second within ten minutes, with recent_orders, the count. The
# stage has no event_time, so an order's event time is when its entry was written: on the test's
# virtual clock, when it is sent.

run "customers who order again within ten minutes" {
  send {
    source = source.orders
    file   = "../orders.jsonl"
  }
  # Alice (orders 1 and 4) and Bob (2 and 7) order twice; the others once.
  expect {
    sink = sink.bursts
    messages = [
      { key = "alice", payload = { id = 4, customer = "alice", amount = 990, country = "DE", recent_orders = 2 } },
      { key = "bob", payload = { id = 7, customer = "bob", amount = 15, country = "FR", recent_orders = 2 } },
    ]
  }
  assert {
    condition     = metrics.velocity.filtered == 5 && metrics.velocity.dead_lettered == 0
    error_message = "the first order of each customer passes nothing on"
  }
}

run "an order more than ten minutes after the customer's latest does not count them" {
  reset = true
  send {
    source = source.orders
    messages = [
      { payload = { id = 11, customer = "frank", amount = 10, country = "DE" } },
      { payload = { id = 12, customer = "frank", amount = 10, country = "DE" }, at = "+9m" },
      { payload = { id = 13, customer = "frank", amount = 10, country = "DE" }, at = "+18m" },
      { payload = { id = 14, customer = "frank", amount = 10, country = "DE" }, at = "+29m" },
      { payload = { id = 15, customer = "frank", amount = 10, country = "DE" }, at = "+30m" },
    ]
  }
  # 12 and 13 come 9 minutes after the one before; 14 comes 11 minutes after 13 (frank's timer,
  # 10 minutes after 13, has forgotten him meanwhile), and 15 a minute after 14.
  expect {
    sink = sink.bursts
    messages = [
      { key = "frank", payload = { id = 12, customer = "frank", amount = 10, country = "DE", recent_orders = 2 } },
      { key = "frank", payload = { id = 13, customer = "frank", amount = 10, country = "DE", recent_orders = 2 } },
      { key = "frank", payload = { id = 15, customer = "frank", amount = 10, country = "DE", recent_orders = 2 } },
    ]
  }
}

run "what the function remembers survives a crash" {
  reset = true
  send {
    source   = source.orders
    messages = [{ id = 21, customer = "grace", amount = 10, country = "DE" }]
  }
  step {
    crash = true # the process dies; another takes the partition over, with grace's order in its state
  }
  step {
    send {
      source   = source.orders
      messages = [{ id = 22, customer = "grace", amount = 10, country = "DE" }]
    }
  }
  expect {
    sink     = sink.bursts
    messages = [{ key = "grace", payload = { id = 22, customer = "grace", amount = 10, country = "DE", recent_orders = 2 } }]
  }
}
