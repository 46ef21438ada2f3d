mod api_objects;
mod imagepulljob;
mod manager;
mod nodeimage;
mod smoke;
mod support;
