from django.db import models


class Order(models.Model):
    email = models.CharField(max_length=200)
    shipped = models.BooleanField(default=False)
