import time
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer
config = ClientConfiguration("127.0.0.1:8081", Credentials())
producer = Producer(config, ("OrderTimeout",)); producer.startup()
m = Message(); m.topic = "OrderTimeout"; m.body = b"order-1 unpaid"; m.keys = "order-1"
m.delivery_timestamp = int(time.time()) + 5          # this client sends epoch seconds; 30 min: + 1800
receipt = producer.send(m)                           # paid in time? producer.recall_message("OrderTimeout", receipt.recall_handle)
consumer = SimpleConsumer(config, "OrderService", {"OrderTimeout": FilterExpression()}); consumer.startup()
while not (messages := consumer.receive(32, 15)):    # up to 32, invisible for 15 s unless acked
    pass
for msg in messages: print(msg.body, "due", msg.delivery_timestamp); consumer.ack(msg)
producer.shutdown(); consumer.shutdown()
