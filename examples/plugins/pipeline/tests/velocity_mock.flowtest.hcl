# A mock stands in for a stateful function as for a plain one: each call gets the message and
# returns its result, and the mock keeps no state and sets no timers. The stage stays stateful (it
# processes each partition in order, with the partition's lease).

mock "acme.velocity" {
  result {
    drop  = true
    times = 1
  }
  result {
    output = merge(msg, { recent_orders = 99 })
  }
}

run "the mock decides which orders pass" {
  send {
    source = source.orders
    messages = [
      { id = 31, customer = "heidi", amount = 10, country = "DE" },
      { id = 32, customer = "heidi", amount = 10, country = "DE" },
    ]
  }
  expect {
    sink     = sink.bursts
    messages = [{ key = "heidi", payload = { id = 32, customer = "heidi", amount = 10, country = "DE", recent_orders = 99 } }]
  }
}
