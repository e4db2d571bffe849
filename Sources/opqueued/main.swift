print("opqueued")
