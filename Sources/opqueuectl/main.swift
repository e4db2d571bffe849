print("opqueuectl")
