from django.urls import path

from tests.django_project.shop import views

urlpatterns = [path("orders", views.place_order)]
