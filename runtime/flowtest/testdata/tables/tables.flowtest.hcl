run "a key not updated for ten minutes is forgotten" {
  send {
    topic    = topic.customers
    messages = [{ customer_id = "c1", tier = "gold" }, { customer_id = "c2", tier = "silver" }]
  }
  step {
    advance = "6m"
  }
  step {
    send {
      topic    = topic.customers
      messages = [{ customer_id = "c2", tier = "gold" }]
    }
    # c1 is 15 minutes old, c2 9: the table's watermark moves on with the clock while its topic is
    # idle (a minute's idle timeout, then through the repartition hop, so a little behind it).
    advance = "9m"
  }
  step {
    send {
      topic    = topic.orders
      messages = [{ order_id = "o1", customer_id = "c1" }, { order_id = "o2", customer_id = "c2" }]
    }
  }
  expect {
    sink  = sink.out
    match = "unordered"
    messages = [
      { order_id = "o1", customer_id = "c1", customer = null },
      { order_id = "o2", customer_id = "c2", customer = { customer_id = "c2", tier = "gold" } },
    ]
  }
}

run "the timer that forgets a key survives a crash" {
  step {
    crash = true
  }
  step {
    # c2 was last updated 9 minutes before the crash: 10 minutes on, a new customer's entry moves
    # the table's watermark past its time.
    advance = "10m"
  }
  step {
    send {
      topic    = topic.customers
      messages = [{ customer_id = "c3", tier = "bronze" }]
    }
  }
  step {
    send {
      topic    = topic.orders
      messages = [{ order_id = "o3", customer_id = "c2" }]
    }
  }
  expect {
    sink     = sink.out
    messages = [{ order_id = "o3", customer_id = "c2", customer = null }]
  }
}
