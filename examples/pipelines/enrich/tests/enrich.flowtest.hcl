# The enrich example under test: a lookup adds each order's customer, as the table holds it when the
# order is processed.

run "orders get the latest record of their customer" {
  send {
    source = source.customers
    file   = "../data/customers.jsonl"
  }
  step {
    send {
      source = source.orders
      file   = "../data/orders.jsonl"
    }
  }
  expect {
    sink  = sink.out
    match = "unordered"
    messages = [
      { order_id = "o1", customer_id = "c1", amount = 30, customer = { customer_id = "c1", name = "Ada", tier = "gold" } },
      { order_id = "o2", customer_id = "c2", amount = 12.5, customer = { customer_id = "c2", name = "Grace", tier = "gold" } },
      { order_id = "o3", customer_id = "c9", amount = 7, customer = null },
      { order_id = "o4", customer_id = "c3", amount = 99, customer = { customer_id = "c3", name = "Linus", tier = "bronze" } },
      { order_id = "o5", customer_id = "c2", amount = 5, customer = { customer_id = "c2", name = "Grace", tier = "gold" } },
      { order_id = "o6", customer_id = "c4", amount = 41, customer = { customer_id = "c4", name = "Barbara", tier = "silver" } },
    ]
  }
  assert {
    condition     = metrics["customers.table"].absorbed == 5 && metrics.enriched.out == 6
    error_message = "the table takes in every customer record, and every order goes on"
  }
}

run "a change applies to the orders processed after it" {
  step {
    send {
      source   = source.customers
      messages = [{ customer_id = "c9", name = "Edsger", tier = "silver" }]
    }
  }
  step {
    send {
      source   = source.orders
      messages = [{ order_id = "o7", customer_id = "c9", amount = 3 }]
    }
  }
  expect {
    sink     = sink.out
    messages = [{ order_id = "o7", customer_id = "c9", amount = 3, customer = { customer_id = "c9", name = "Edsger", tier = "silver" } }]
  }
}

run "a null payload deletes its customer" {
  step {
    send {
      topic    = topic.customers
      messages = [{ key = "c1", payload = null }]
    }
  }
  step {
    send {
      source   = source.orders
      messages = [{ order_id = "o8", customer_id = "c1", amount = 1 }]
    }
  }
  expect {
    sink     = sink.out
    messages = [{ order_id = "o8", customer_id = "c1", amount = 1, customer = null }]
  }
}

run "the table survives a crash" {
  step {
    crash = true
  }
  step {
    send {
      source   = source.orders
      messages = [{ order_id = "o9", customer_id = "c4", amount = 2 }]
    }
  }
  expect {
    sink     = sink.out
    messages = [{ order_id = "o9", customer_id = "c4", amount = 2, customer = { customer_id = "c4", name = "Barbara", tier = "silver" } }]
  }
}
