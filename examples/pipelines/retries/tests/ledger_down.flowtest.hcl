# The ledger stays down: after the five attempts of retry.webhook the payment is dead-lettered.

override_sink "ledger" {
  responses = [503]
}

run "a payment is dead-lettered after five attempts" {
  send {
    source   = source.payments
    messages = [{ id = "pay-1", account = "acct-1", amount = "15" }]
  }
  expect_dead_letters {
    sink     = sink.ledger
    count    = 1
    messages = [{ reason = "503", attempts = 5 }]
  }
}
